"""PipeTransformer's elastic pipelining (He et al., ICML 2021) on torch.distributed.pipelining.

    stages.py    a pipeline stage = an HF model's own forward over a slice of its layers (any family)
    autopipe.py  AutoPipe: balanced partition, K-halving memory rule, micro-batch candidates, the profile
    mesh.py      AutoDP: the (dp, pp) DeviceMesh and the layout (which rank holds which layers)
    transfer.py  weights and AdamW state moved between ranks by FQN (no files); checkpoint gathering
    runtime.py   one rank's stage and one step on it (frozen prefix or AutoCache, schedule, reductions)
    checks.py    what a pipelined config refuses, naming the field
    logs.py      the readable lines at every change
    engine.py    PipelineEngine: the trainer's engine for a pipelined run (progressive.cli passes it to the one
                 Trainer when parallel.pipeline is set)
"""
