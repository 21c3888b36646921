"""The sidebar: the run picker, the time-range filter, and following a run still being written.

Every page draws it first (`controls.render()`); the app's entry file follows a live run in it.
"""
