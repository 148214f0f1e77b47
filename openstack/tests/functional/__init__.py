"""The plug-in in Nova's functional harness, against the project's real binaries."""
