"""A minimal TAP producer for the Python end-to-end tests: check() runs one named check, done()
prints the plan and returns the exit status."""

import sys

results = []


def check(name, fn):
    """Runs fn; an exception fails the check and is printed as diagnostics."""
    try:
        fn()
        results.append(True)
        print("ok %d - %s" % (len(results), name))
    except Exception as e:  # a failed assertion, or a peer misbehaving
        results.append(False)
        print("not ok %d - %s" % (len(results), name))
        for line in repr(e).splitlines():
            print("# " + line[:2000])
    sys.stdout.flush()


def done():
    print("1..%d" % len(results))
    return 0 if all(results) else 1
