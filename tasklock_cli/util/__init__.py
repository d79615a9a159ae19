"""What every layer uses and that knows nothing of locks: clocks, durations, key rules, the
sanitiser of foreign text, data classes and paths without their costly imports, file
descriptors, times, lazy imports.
"""
