"""Runs before the rest of the package is imported: a checkout that was never built, or a build
made for another torch, becomes one readable ImportError here instead of `No module named
'graphed._native'` or an undefined symbol further down."""

from ._library import check_build

check_build()
