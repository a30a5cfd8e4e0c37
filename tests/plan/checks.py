"""The small harness of tests/plan's Python checks: each check counted, each failure
printed with what it got, and one closing line, "NAME: N of M checks passed", that the
test's CTest regex matches."""

import sys


class Checks:
    def __init__(self, name):
        self.name = name
        self.passed = self.failed = 0

    def __call__(self, what, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f"{self.name}: FAILED: {what} {detail}")

    def finish(self):
        """Prints the closing line and exits: 1 when any check failed."""
        print(f"{self.name}: {self.passed} of {self.passed + self.failed} checks passed")
        sys.exit(1 if self.failed else 0)
