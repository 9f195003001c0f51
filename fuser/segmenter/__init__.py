"""The segmenter: which ops share a kernel."""

from fuser.segmenter.classify import Kind, Layout, Rejected, classify
from fuser.segmenter.segment import Segment, segment

__all__ = ["Kind", "Layout", "Rejected", "Segment", "classify", "segment"]
