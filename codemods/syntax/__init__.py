"""The CST machinery the rules stand on, apart from the rules themselves:
the parse (``parsing``), the per-tree cache and node helpers (``tree``,
``nodes``), running a transformer without rebuilding what it leaves alone
(``traverse``), the code of a rewritten tree (``splice``), cheap start
positions (``positions``), import requests (``imports``) and statement
edits (``edits``)."""
