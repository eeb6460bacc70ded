"""Goodness-of-fit helper for the statistical losslessness tests (the package's own: `specdecode check`
runs the same test)."""

from specdecode.lossless import chi2_pvalue  # noqa: F401
