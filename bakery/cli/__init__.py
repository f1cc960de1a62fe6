"""What each invoke task does, as functions: typed values in, typed values out, errors raised
(every exit code is in errors.py). tasks.py parses flags, makes one call here and prints what it
gets back through render.py; nothing here prints (progress goes to the `log` it is given)."""
