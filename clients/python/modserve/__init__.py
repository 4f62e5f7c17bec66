"""Generated gRPC stubs of the modserve API (see generate_stubs.sh)."""
