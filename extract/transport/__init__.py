"""Bytes: hub files read by range, positioned reads past the page cache, reused buffers, the cache folder."""
