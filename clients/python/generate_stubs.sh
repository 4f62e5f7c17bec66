#!/bin/sh
# Regenerates the committed Python stubs of modserve.v1 (needs protoc and grpc_python_plugin from
# Debian's protobuf-compiler and protobuf-compiler-grpc; grpcio-tools is not required).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
protoc --proto_path="$root/proto" --python_out="$here" --grpc_out="$here" \
  --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" \
  "$root/proto/modserve/v1/modserve.proto"
