"""Data: the built-in sources, the loaders that feed any source, and the data gears."""
