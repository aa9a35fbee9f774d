"""The pinned sglang release and the table of everything SGLangEngine uses of it.

``SGLANG_VERSION`` is the release the adapter (rollout/sglang_engine.py and its modules
sglang_launch, sglang_translation, sglang_streaming, sglang_weights) is written against;
``INSTALL_HINT`` says how to get it. Every SGLang entry point, keyword argument, server-arg
field, sampling-param name, meta_info key, constant and environment variable the adapter uses
is listed in ``USED_API``; tests/rollout/test_sglang_api.py checks each against the source of
the pinned wheel (read with ``ast``, never imported) and parses the adapter's modules to make
sure every SGLang call/import they make is listed here. Add to USED_API whenever you add a use
of SGLang in the adapter.
"""

from __future__ import annotations

from typing import Any, Dict

from megatron_dapo.rollout.base import CUDA_GRAPH, KV_CACHE, WEIGHTS

# The pinned release (a constant, not a data file, so a non-editable install has it too).
SGLANG_VERSION = "0.5.23"

INSTALL_HINT = (
    f"SGLangEngine needs sglang=={SGLANG_VERSION}: pip install megatron-dapo[gpu] on a GPU machine, "
    f"bash scripts/setup_env.sh on a CPU one (the primary stack carries it)"
)

RAW_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"
#: Captures SGLang's CUDA graphs under its memory saver (tag "cuda_graph"); see graph_saver_launch.
GRAPH_SAVER_ENV = "SGLANG_MEMORY_SAVER_CUDA_GRAPH"
#: set before SGLang starts on a CPU: its layers take their torch paths (rollout/sglang_cpu.py)
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
FLATTENED_BUCKET = "flattened_bucket"

# Single source of truth for what the adapter uses of SGLang. Checked against the pinned
# wheel by tests/rollout/test_sglang_api.py. Modules are dotted paths inside the wheel.
USED_API: Dict[str, Any] = {
    # (module, "Class.method" or "function", keyword arguments we pass by name)
    "callables": [
        (
            "sglang.srt.entrypoints.engine",
            "Engine.generate",
            ("input_ids", "sampling_params", "return_logprob", "logprob_start_len", "return_routed_experts"),
        ),
        (
            "sglang.srt.entrypoints.engine",
            "Engine.async_generate",
            ("input_ids", "sampling_params", "return_logprob", "rid", "return_routed_experts"),
        ),
        (
            "sglang.srt.entrypoints.engine",
            "Engine.update_weights_from_tensor",
            ("named_tensors", "load_format", "flush_cache"),
        ),
        ("sglang.srt.entrypoints.engine", "Engine.begin_weight_update", ()),
        # weights over a collective group (hybrid/weight_broadcast.py is the sender)
        (
            "sglang.srt.entrypoints.engine",
            "Engine.init_weights_update_group",
            ("master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"),
        ),
        (
            "sglang.srt.entrypoints.engine",
            "Engine.update_weights_from_distributed",
            ("names", "dtypes", "shapes", "group_name", "flush_cache"),
        ),
        ("sglang.srt.entrypoints.engine", "Engine.destroy_weights_update_group", ("group_name",)),
        (
            "sglang.srt.utils.common",
            "init_custom_process_group",
            ("backend", "init_method", "world_size", "rank", "group_name"),
        ),
        ("sglang.srt.entrypoints.engine", "Engine.end_weight_update", ()),
        ("sglang.srt.entrypoints.engine", "Engine.release_memory_occupation", ("tags",)),
        ("sglang.srt.entrypoints.engine", "Engine.resume_memory_occupation", ("tags",)),
        ("sglang.srt.entrypoints.engine", "Engine.flush_cache", ()),
        ("sglang.srt.entrypoints.engine", "Engine.get_server_info", ()),
        ("sglang.srt.entrypoints.engine", "Engine.shutdown", ()),
        ("sglang.srt.managers.tokenizer_manager", "TokenizerManager.abort_request", ("rid", "abort_all")),
        # TokenizerManager's check_weights (the offline Engine has no method for it), called as
        # the Engine's own methods call the tokenizer manager: loop.run_until_complete(...)
        ("sglang.srt.managers.tokenizer_control_mixin", "TokenizerControlMixin.check_weights", ("obj", "request")),
        # the weight version its scheduler stamps on the requests in flight (set_weight_version)
        ("sglang.srt.managers.tokenizer_control_mixin", "TokenizerControlMixin.update_weight_version", ("obj",)),
        ("sglang.srt.utils.common", "MultiprocessingSerializer.serialize", ("obj", "output_str")),
        ("sglang.srt.utils.common", "MultiprocessingSerializer.deserialize", ()),
        # the weight checker's hash (weight_checker._hash_tensor calls it), for ProbeHashes
        ("sglang.srt.managers.mm_utils", "tensor_hash", ()),
        ("sglang.srt.utils.patch_torch", "monkey_patch_torch_reductions", ()),
    ],
    # attributes we read on instances: (module, class, attribute assigned in the class)
    "attributes": [
        ("sglang.srt.entrypoints.engine", "Engine", "tokenizer_manager"),
        ("sglang.srt.entrypoints.engine", "Engine", "loop"),
        # streaming: whether a request reached the scheduler (abort_requests waits for it)
        ("sglang.srt.managers.tokenizer_manager", "TokenizerManager", "rid_to_state"),
        ("sglang.srt.managers.tokenizer_manager", "ReqState", "dispatched"),
        # the engine's parameter dtype (ProbeHashes casts the expected layout to it)
        ("sglang.srt.managers.tokenizer_manager", "TokenizerManager", "model_config"),
        ("sglang.srt.configs.model_config", "ModelConfig", "dtype"),
    ],
    # names we import: (module, name); "sglang" itself must export Engine
    "imports": [
        ("sglang", "Engine"),
        ("sglang.srt.utils.common", "MultiprocessingSerializer"),
        ("sglang.srt.utils.patch_torch", "monkey_patch_torch_reductions"),
        ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"),
        ("sglang.srt.managers.io_struct", "CheckWeightsReqInput"),
        ("sglang.srt.managers.io_struct", "UpdateWeightVersionReqInput"),
        ("sglang.srt.utils.common", "init_custom_process_group"),
        ("sglang.srt.managers.mm_utils", "tensor_hash"),
    ],
    # Engine(**kwargs) are ServerArgs fields
    "server_args": (
        "model_path",
        "tokenizer_path",
        "tp_size",
        "mem_fraction_static",
        "base_gpu_id",
        "enable_memory_saver",
        "dtype",
        "random_seed",
        "enable_deterministic_inference",
        "trust_remote_code",
        "log_level",
        "disable_cuda_graph",
        "context_length",
        "port",
        "load_format",
        "cuda_graph_backend_prefill",
        # routing replay: the scheduler captures each MoE layer's top-k (arg_groups/fields/exec_.py)
        "enable_return_routed_experts",
        # an engine on the CPU (rollout/sglang_cpu.py: CPU_SERVER_ARGS, the KV pool in tokens)
        "device",
        "attention_backend",
        "max_total_tokens",
        "sleep_on_idle",
    ),
    # keys of the sampling_params dicts we send (sglang.srt.sampling.sampling_params.SamplingParams)
    "sampling_params": (
        "temperature",
        "top_p",
        "top_k",
        "max_new_tokens",
        "n",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "sampling_seed",
    ),
    # dataclass fields we fill: (module, class, fields)
    "dataclass_fields": [
        (
            "sglang.srt.weight_sync.tensor_bucket",
            "FlattenedTensorMetadata",
            ("name", "shape", "dtype", "start_idx", "end_idx", "numel"),
        ),
        (
            "sglang.srt.managers.io_struct",
            "CheckWeightsReqInput",
            ("action", "allow_quant_error", "skip_tensor_list", "selector"),
        ),
        ("sglang.srt.managers.io_struct", "UpdateWeightVersionReqInput", ("new_version", "abort_all_requests")),
        # one per rank in check_weights' answer (we read tp/dp/pp rank and size)
        (
            "sglang.srt.managers.io_struct",
            "ParallelismInfo",
            ("role", "tp_rank", "tp_size", "dp_rank", "dp_size", "pp_rank", "pp_size", "rank", "size"),
        ),
    ],
    # string literals that must appear in a module: the receiving side of our protocols
    "string_literals": [
        # load_format branch and the keys of the payload dict it reads
        (
            "sglang.srt.model_executor.model_runner_components.weight_updater",
            (FLATTENED_BUCKET, "flattened_tensor", "metadata"),
        ),
        # meta_info keys and finish_reason types we read
        (
            "sglang.srt.managers.tokenizer_manager",
            (
                "meta_info",
                "finish_reason",
                "output_token_logprobs",
                "input_token_logprobs",
                "output_ids",
                "routed_experts",
            ),
        ),
        # each finished request's per-token weight versions (GenerationOutput.token_versions)
        ("sglang.srt.utils.weight_versions", ("weight_versions", "version", "start", "end")),
        ("sglang.srt.managers.schedule_batch", ("type", "stop", "length", "abort")),
        # an aborted queued request is answered with finish type "abort" and its output ids
        ("sglang.srt.managers.tokenizer_manager", ("abort", "output_ids", "Abort in waiting queue")),
        # the session rule we follow (refusal messages of the scheduler's weight updater)
        (
            "sglang.srt.managers.scheduler_components.weight_updater",
            ("update_weights_from_tensor must run between begin_weight_update() and end_weight_update()",),
        ),
        # load_format="dummy": random weights at launch, the first sync fills them
        ("sglang.srt.configs.load_config", ("dummy",)),
        # why the prefill graph is disabled when graphs are captured under the memory saver
        (
            "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend",
            ("Breakable CUDA graph is not compatible with memory saver mode",),
        ),
        ("sglang.srt.model_executor.cuda_graph_config", ("disabled",)),
        # the weight checker's actions we use (check_weights) and the answer's keys we read
        ("sglang.srt.utils.weight_checker", ("reset_tensors", "checksum")),
        ("sglang.srt.managers.scheduler_components.weight_updater", ("checksums", "parallelism_info")),
    ],
    # module-level constants: (module, name, value)
    "constants": [
        ("sglang.srt.constants", "GPU_MEMORY_TYPE_WEIGHTS", WEIGHTS),
        ("sglang.srt.constants", "GPU_MEMORY_TYPE_KV_CACHE", KV_CACHE),
        ("sglang.srt.constants", "GPU_MEMORY_TYPE_CUDA_GRAPH", CUDA_GRAPH),
    ],
    # environment variables we set: (module that declares/reads it, name)
    "env_vars": [
        ("sglang.srt.environ", RAW_LOGPROB_ENV),
        ("sglang.srt.layers.sampler", RAW_LOGPROB_ENV),
        ("sglang.srt.environ", GRAPH_SAVER_ENV),
        ("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend", GRAPH_SAVER_ENV),
        # an engine on the CPU (rollout/sglang_cpu.py)
        ("sglang.srt.platforms", CPU_ENGINE_ENV),
        ("sglang.srt.utils.common", CPU_ENGINE_ENV),
    ],
}
