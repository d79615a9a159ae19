"""What every layer uses and that knows nothing of locks: clocks, durations, whole
numbers, key rules, the sanitiser of foreign text, data classes and paths without their
costly imports, file descriptors, times, lazy imports.
"""
