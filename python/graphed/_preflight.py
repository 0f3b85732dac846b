"""Runs before the rest of the package is imported: a checkout that was never built, or a build
made for another torch, becomes one readable ImportError here instead of `No module named
'graphed._native'` or an undefined symbol further down. Under `python -m graphed` (the install
check) the same finding is the doctor's report and exit status 1, not a traceback; and there the
doctor imports torch first, turning torch's own warning about NumPy into a line of its report.
"""

import sys

if sys.argv[:1] == ["-m"]:  # maybe `python -m graphed` (see _doctor.running_as_doctor)
    from ._doctor import import_torch_quietly

    import_torch_quietly()

from ._library import check_build  # noqa: E402  (after the doctor's import of torch)

try:
    check_build()
except ImportError as error:
    from ._doctor import exit_if_doctor

    exit_if_doctor(error)
    raise
