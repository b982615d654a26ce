"""What deploys the service beside its images: the images' package pins (constraints.py) and Ray Serve's config."""
