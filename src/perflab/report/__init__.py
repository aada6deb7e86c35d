"""Reports: terminal tables, CSV/JSON export of result rows, markdown reports and plots."""
