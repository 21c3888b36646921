"""The app's pages, in the order of its navigation: the one list the app and its tests read.

(The page files live in `visualizer/views/`, not `pages/`: Streamlit treats a `pages/` folder
beside the entry file as an old-style multipage app and would bypass `st.navigation`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VIEWS = Path(__file__).parent / "views"


@dataclass(frozen=True)
class Page:
    """A page: its file in `visualizer/views/`, its title, whether the app opens on it, and
    the optional feature of a run it shows, if any (collector/queries/features.py): a run
    without it leaves the page out of the navigation (visualizer/page_selection.py)."""

    file: str
    title: str
    default: bool = False
    needs: str = ""

    @property
    def path(self) -> str:
        """The page as `st.switch_page` and `AppTest.switch_page` name it."""
        return f"views/{self.file}"

    @property
    def url_path(self) -> str:
        """Where the page is served, as Streamlit names it: the file's stem, "" by default."""
        return "" if self.default else Path(self.file).stem


PAGES = (
    Page("overview.py", "Overview", default=True),
    Page("requests.py", "Requests"),
    Page("hotspots.py", "Hotspots"),
    Page("prefix_tree.py", "Prefix tree"),
    Page("roi.py", "ROI"),
    Page("free_blocks.py", "Free blocks"),
    Page("kv_groups.py", "KV cache groups", needs="hybrid"),
    Page("collisions.py", "Collisions", needs="collisions_checked"),
    Page("tenants.py", "Tenants & adapters"),
    Page("fleet.py", "Fleet", needs="engines"),
    Page("advisor.py", "Advisor"),
    Page("policies.py", "Cache policies"),
    Page("compare.py", "Compare runs"),
    Page("vllm_kv_events.py", "vLLM KV events", needs="vllm_kv_events"),
)
