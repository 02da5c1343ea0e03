"""The run audit (``stoker audit``): :func:`audit` runs every check over one run (``checks``).

One module per check (``stream``, ``replay``, ``content``, ``coverage``, ``compare``,
``integrity``, ``stall``, ``mixture``, ``mixture_content``), the run as the audit reads it
(``run``), the results (``report``) and their HTML rendering (``html``, ``svg``).
"""

from stoker.tools.audit.checks import audit

__all__ = ["audit"]
