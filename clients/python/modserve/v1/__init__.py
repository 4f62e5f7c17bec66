"""Generated from proto/modserve/v1/modserve.proto; do not edit."""
