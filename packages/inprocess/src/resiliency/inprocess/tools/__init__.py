"""Tools for trying in-process restart out, under NVRx's ``inprocess.tools`` names."""

from resiliency.inprocess.tools import inject_fault

__all__ = ["inject_fault"]
