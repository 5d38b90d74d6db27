"""The runner the test scripts share when run as `python3 <script>` (tests/python.rs does so)."""


def run_tests(namespace):
    """Runs every callable `test_*` in `namespace` (a script's globals()), reporting each failure
    and going on; returns the exit status: 1 if any failed."""
    tests = [(n, f) for n, f in sorted(namespace.items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, f in tests:
        try:
            f()
            print(f"ok   {name}", flush=True)
        except Exception as e:  # report every failure, then fail
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    print(f"{len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0
