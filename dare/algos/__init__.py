"""RL algorithms, one file each (registered by name); ``core.py`` holds what they share."""
