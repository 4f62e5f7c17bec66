"""A small typed client for the modserve gRPC API (modserve.v1.ModServe).

The generated stubs live next to this package in ``modserve/v1`` (regenerate them with
``generate_stubs.sh``); this wrapper only adds plain dataclasses and defaults.
"""

from modserve_client.client import (
    Client,
    Generation,
    StreamChunk,
    RoutingLayer,
)

__all__ = ["Client", "Generation", "StreamChunk", "RoutingLayer"]
