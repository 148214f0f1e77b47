"""Each module of the plug-in on its own."""
