# The outpost binary in a small image. Build from the repository root:
#   docker build -t ghcr.io/outpost/outpost:<version> .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Without the default `demo` feature: the shipped binary has no fake apiserver and no kube client.
RUN cargo build --release --locked -p outpost --no-default-features

# glibc and libgcc, nothing else. The static pod runs it as root (it reads kubelet's client key);
# anywhere else it runs as the image's nonroot user.
FROM gcr.io/distroless/cc-debian12:nonroot
# On PATH, so the static pod's `command: [outpost, ...]` finds it.
COPY --from=build /src/target/release/outpost /usr/local/bin/outpost
ENTRYPOINT ["/usr/local/bin/outpost"]
