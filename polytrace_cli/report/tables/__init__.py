"""Report tables (T1), one module each, drawn from analysis summaries like the figures."""
