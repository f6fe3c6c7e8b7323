"""Generated protobuf and gRPC stubs for package epd.v1 (scripts/gen_protos.sh). Do not edit."""
