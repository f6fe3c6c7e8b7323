"""Image loading under limits (size, pixels, time, SSRF), normalisation, hashing and caching."""
