"""Models arrive with their issue; the app is installed so migrations have a home."""
