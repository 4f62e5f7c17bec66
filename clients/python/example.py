"""Example: one unary call and one stream against a running modserve.

    python3 clients/python/example.py --server 127.0.0.1:50051 --prompt "Once upon a time"
    python3 clients/python/example.py --server 127.0.0.1:5001,127.0.0.1:5002 \
        --lb_policy round_robin --retries 3          # two replicas, per-call balancing
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from modserve_client import Client  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="127.0.0.1:50051",
                        help="host:port, ip:port,ip:port,... or a gRPC URI (dns:///name:port)")
    parser.add_argument("--lb_policy", choices=["pick_first", "round_robin"], default=None)
    parser.add_argument("--retries", type=int, default=0, help="resends on UNAVAILABLE")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--max_new_tokens", type=int, default=32)
    args = parser.parse_args()
    with Client(args.server, lb_policy=args.lb_policy, retries=args.retries) as client:
        print("health:", client.health())
        gen = client.generate(args.prompt, max_new_tokens=args.max_new_tokens)
        print("unary:", repr(gen.text), gen.finish_reason, f"ttft {gen.ttft_seconds * 1e3:.1f} ms")
        for layer in gen.routing:
            print(f"  layer {layer.layer}: computed {layer.computed_fraction:.0%}")
        print("stream: ", end="", flush=True)
        for chunk in client.stream(args.prompt, max_new_tokens=args.max_new_tokens):
            print(chunk.text, end="", flush=True)
        print()


if __name__ == "__main__":
    main()
