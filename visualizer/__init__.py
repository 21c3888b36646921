"""kvscope's Streamlit app: pages that call collector queries and draw pure Plotly figures."""
