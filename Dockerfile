# The outpost binary in a small image. Build from the repository root:
#   docker build -t ghcr.io/outpost/outpost:<version> .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p outpost

# glibc and libgcc, nothing else. The static pod runs it as root (it reads kubelet's client key);
# anywhere else it runs as the image's nonroot user.
FROM gcr.io/distroless/cc-debian12:nonroot
# On PATH, so the static pod's `command: [outpost, ...]` finds it.
COPY --from=build /src/target/release/outpost /usr/local/bin/outpost
ENTRYPOINT ["/usr/local/bin/outpost"]
