# gearshift on CUDA: torchrun starts one process per GPU of the machine.
#   docker build -t gearshift .                       (make docker)
#   docker run --gpus all --ipc=host gearshift amp=on experiment=fast
# Arguments after the image name are train.py's overrides.
FROM pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, from pyproject.toml alone: this layer is rebuilt only when they change.
# torch and torchvision come with the base image and already satisfy the ranges.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The code last: editing it rebuilds only the layers from here on.
COPY README.md train.py ./
COPY conf/ conf/
COPY src/ src/
RUN pip install --no-cache-dir --no-deps . \
    && useradd --create-home --uid 10001 --user-group gearshift \
    && chown gearshift:gearshift /app

USER 10001:10001
ENTRYPOINT ["python", "-m", "gearshift.torchrun", "--nproc_per_node=gpu", "train.py"]
