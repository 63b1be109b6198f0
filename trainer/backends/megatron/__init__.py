"""The Megatron training backend (`actor.strategy: megatron`): megatron-core's GPT model behind `Actor`.

- `backend.py`   `MegatronActor`: build, forward/backward, optimizer, weights in HF names
- `attention.py` attention masks and the attention implementation megatron-core is given
- `experts.py`   expert-parallel weight layout (HF per-expert <-> megatron grouped experts)
- `gpu.py`       the fused GPU step
- `moe.py`       MoE layer specs and the router/aux-loss settings
- `norm.py`      the norm layers and their HF names
- `pipeline.py`  pipeline-parallel schedule and the stage split
- `critic.py`    `MegatronCritic`: PPO's value model (GPTModel body + replicated `Linear(H, 1)` head)

May import: what `trainer.backends` may import, `trainer.backends.actor` and `trainer.backends.critic`. Nothing
above the backends.
"""
