"""pprof's profile.proto and the code protoc generated from it (scripts/build_proto.sh writes
it; `make test` fails when the two differ)."""
