"""Every write of the issues app goes through these functions (``<entity>_<verb>``)."""
