"""Global tier: GeoDNS (with EDNS Client Subnet) and the HTTP front door; picks a region."""
