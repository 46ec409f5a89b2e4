"""Real-browser tests: Playwright driving Debian's Chromium against sim → collector → store → app."""
