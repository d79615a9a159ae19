"""What every layer uses and that knows nothing of locks: clocks, durations, whole
numbers, key rules, the sanitiser of foreign text, a malformed record's fields shown, data
classes and paths without their costly imports, file descriptors, times, lazy imports.
"""
