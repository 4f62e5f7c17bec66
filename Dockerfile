# syntax=docker/dockerfile:1
# modserve container images. Two targets, both Debian 12 so tools/install_deps.sh (Debian package
# names) runs unchanged in every stage; it does not build models, run tests or push images.
#   docker build -t modserve:cuda .                 # default: CUDA 12 runtime image (last stage)
#   docker build --target cpu -t modserve:cpu .     # CPU-only image on debian:12-slim
#   docker run --gpus all -p 50051:50051 -p 9400:9400 modserve:cuda
#
# Why not nvidia/cuda:*-devel-ubuntu*: install_deps.sh names Debian 12 packages (libgrpc++1.51,
# libprotobuf32, libabsl20220623, ...); Ubuntu 22.04 ships other gRPC/protobuf/abseil versions and
# 24.04 renamed them (t64), so the script would not resolve there. The CUDA stages instead add
# NVIDIA's official Debian 12 CUDA apt repository (same packages as the nvidia/cuda images, built
# for Debian) to debian:12 and install only what the CUDA backend links: nvcc, cudart and cuBLAS.
# The driver (libcuda) comes from the host through the NVIDIA container toolkit.

ARG DEBIAN_IMAGE=debian:12
ARG DEBIAN_SLIM_IMAGE=debian:12-slim
# CUDA 12.6 supports GCC 12 (Debian 12's compiler) and sm_80/sm_90, the default architectures.
# Packages are named with a dash (cuda-nvcc-12-6), paths with a dot (/usr/local/cuda-12.6).
ARG CUDA_VERSION=12.6
ARG CUDA_KEYRING_URL=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb

# ---- build-base: compilers and -dev packages, from the same script README and CI run ----
FROM ${DEBIAN_IMAGE} AS build-base
WORKDIR /src
COPY tools/install_deps.sh tools/install_deps.sh
RUN MODSERVE_DEPS=build bash tools/install_deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .

# ---- cpu-builder: the CPU build, configured as tools/test.sh configures it ----
FROM build-base AS cpu-builder
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMODSERVE_CUDA=OFF \
      -DMODSERVE_BUILD_TESTS=OFF \
 && cmake --build build -j "$(nproc)" \
      --target modserve modserve-client modserve-loadgen modserve-generate

# ---- cuda-builder: the CUDA devel stage (nvcc + cudart + cuBLAS headers on Debian 12) ----
FROM build-base AS cuda-builder
ARG CUDA_VERSION
ARG CUDA_KEYRING_URL
ADD ${CUDA_KEYRING_URL} /tmp/cuda-keyring.deb
RUN dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && cv="$(echo "${CUDA_VERSION}" | tr . -)" \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "cuda-nvcc-${cv}" "cuda-cudart-dev-${cv}" "libcublas-dev-${cv}" \
 && rm -rf /var/lib/apt/lists/*
# CMAKE_CUDA_ARCHITECTURES defaults to 80;90 (A100, H100/H200); override with --build-arg.
ARG CUDA_ARCHITECTURES=80;90
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMODSERVE_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="/usr/local/cuda-${CUDA_VERSION}/bin/nvcc" \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" -DMODSERVE_BUILD_TESTS=OFF \
 && cmake --build build -j "$(nproc)" \
      --target modserve modserve-client modserve-loadgen modserve-generate

# ---- runtime-base: shared libraries only, a non-root user, the demo checkpoint ----
FROM ${DEBIAN_SLIM_IMAGE} AS runtime-base
WORKDIR /opt/modserve
COPY tools/install_deps.sh tools/install_deps.sh
RUN MODSERVE_DEPS=runtime bash tools/install_deps.sh && rm -rf /var/lib/apt/lists/* tools \
 && groupadd --system --gid 10001 modserve \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin modserve
COPY models/demo models/demo
ENV PATH=/opt/modserve/bin:${PATH}
# 50051: gRPC (ModServe, grpc.health.v1.Health, reflection); 9400: Prometheus /metrics.
EXPOSE 50051 9400
# SERVING only while the engine makes progress; NOT_SERVING while draining (server/health.h).
# The check assumes the default gRPC port; a container started with another --port needs its own.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["modserve-client", "--server", "127.0.0.1:50051", "--timeout", "2s", "health"]
# SIGTERM drains (in-flight requests finish within --drain_timeout) and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["modserve"]

# ---- cpu: the CPU-only image ----
FROM runtime-base AS cpu
COPY --from=cpu-builder /src/build/bin/modserve /src/build/bin/modserve-client \
     /src/build/bin/modserve-loadgen /src/build/bin/modserve-generate /opt/modserve/bin/
USER 10001:10001
CMD ["--model", "/opt/modserve/models/demo", "--host", "0.0.0.0", "--port", "50051", \
     "--metrics_port", "9400", "--backend", "cpu"]

# ---- cuda: the slim CUDA runtime image (cudart + cuBLAS shared libraries, no compiler) ----
FROM runtime-base AS cuda
ARG CUDA_VERSION
ARG CUDA_KEYRING_URL
ADD ${CUDA_KEYRING_URL} /tmp/cuda-keyring.deb
# The packages register their library folder in /etc/ld.so.conf.d; the check fails the build
# here, not the container at start, if cudart or cuBLAS would not be found.
RUN dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && cv="$(echo "${CUDA_VERSION}" | tr . -)" \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "cuda-cudart-${cv}" "libcublas-${cv}" \
 && rm -rf /var/lib/apt/lists/* \
 && ldconfig && ldconfig -p | grep -q libcudart.so.12 && ldconfig -p | grep -q libcublas.so.12
# What the NVIDIA container toolkit reads to mount the driver (libcuda) into the container.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=12.0"
COPY --from=cuda-builder /src/build/bin/modserve /src/build/bin/modserve-client \
     /src/build/bin/modserve-loadgen /src/build/bin/modserve-generate /opt/modserve/bin/
USER 10001:10001
CMD ["--model", "/opt/modserve/models/demo", "--host", "0.0.0.0", "--port", "50051", \
     "--metrics_port", "9400", "--backend", "cuda"]
