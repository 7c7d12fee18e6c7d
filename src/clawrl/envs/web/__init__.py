"""The web GUI family (DESIGN §9): MiniWoB++ pages and our forms in a sandboxed headless Chromium."""
