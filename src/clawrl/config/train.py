"""The trainer's settings (DESIGN §6): the objective (`LossConfig`) and the loop around it (`TrainConfig`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, PlainSerializer
from pydantic_settings import NoDecode

from clawrl.config.base import ComponentSettings, FlagList, Names, as_flag_list, flag_spelling, split_commas
from clawrl.types import AdaptersMode

# Where the trainer reports its metrics (`clawrl.train.trackers`): `--report-to tensorboard,mlflow`.
Trackers = Annotated[list[Literal["tensorboard", "trackio", "wandb", "mlflow"]], NoDecode, BeforeValidator(split_commas),
                     as_flag_list(FlagList), PlainSerializer(flag_spelling)]  # fmt: skip

# How a batch's per-token losses are summed into one (`clawrl.train.losses.sequence_weights`).
LossAggregation = Literal["token-mean", "seq-mean", "constant"]


class LossConfig(ComponentSettings):
    """The training objective (DESIGN §6): method, PPO clip, KL, entropy, OPD and off-policy knobs.

    `train/update.py` consumes it; it lives here, with no torch import, so that every knob is also a
    `clawrl train` / `clawrl serve` flag through `TrainConfig`, which extends it.
    """

    method: Literal["rl", "opd", "combine"] = Field(
        "combine",
        description="Training signal: `rl` (advantage = reward), `opd` (advantage = clipped teacher-minus-policy "
        "log-prob) or `combine` (w_rl * reward + w_opd * teacher term). A sample without teacher log-probs "
        "contributes the RL term only, whatever the method.",
    )
    eps_low: float = Field(0.2, ge=0, lt=1, description="PPO clip below: the ratio is floored at 1 - eps_low.")
    eps_high: float = Field(0.28, ge=0, description="PPO clip above: the ratio is capped at 1 + eps_high.")
    kl_beta: float = Field(
        0.0,
        ge=0,
        description="Weight of the k3 KL to the reference policy (the adapter-free base for LoRA, the frozen "
        "starting weights for full fine-tuning); 0 skips the reference forward pass entirely.",
    )
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus (subtracted from the loss).")
    opd_clip: float = Field(1.0, gt=0, description="C in the OPD advantage clip(log pi_T - log pi_old, -C, C).")
    w_rl: float = Field(1.0, description="Weight of the reward term in the advantage.")
    w_opd: float = Field(1.0, description="Weight of the teacher term (OPD advantage or top-K reverse KL).")
    is_cap: float = Field(
        2.0,
        gt=0,
        description="Cap of the per-token importance weight min(pi_old / pi_behaviour, cap) for off-policy samples.",
    )
    opd_topk: int = Field(
        0,
        ge=0,
        description="With K > 0, keep the teacher's top-K tokens per position and train OPD with the top-K reverse "
        "KL (K + 1 bins) instead of the sampled-token advantage; 0 is off.",
    )
    loss_agg: LossAggregation = Field(
        "token-mean",
        description="How the per-token losses of a batch are summed into one: `token-mean` (every response token of the "
        "batch weighs the same: divided by the batch's token count), `seq-mean` (mean over each response, then over "
        "the responses: every response weighs the same, upstream slime's default) or `constant` (sum over each "
        "response divided by the constant --loss-agg-tokens, then mean over the responses: Dr. GRPO's length-unbiased "
        "sum). Every loss term and statistic is aggregated the same way.",
    )
    loss_agg_tokens: int = Field(
        512,
        ge=1,
        description="C of --loss-agg constant: the fixed normaliser of each response's token sum, best the response "
        "limit the agent asks for (512 is clawrl serve's --default-max-tokens). It only scales the loss and gradient "
        "(AdamW nearly undoes the scale; --grad-clip does not).",
    )


class TrainConfig(LossConfig):
    """The trainer loop (DESIGN §6): which update, on which parameters, how often, and how it publishes.

    `clawrl serve --method ...` starts the trainer as a separate process with these settings;
    `clawrl train` runs it alone.
    """

    method: Literal["rl", "opd", "combine"] | None = Field(
        None,
        description="Update: `rl` (binary reward, A = r), `opd` (on-policy distillation from the hinted teacher) or "
        "`combine` (both). On `clawrl serve`, unset means no trainer; `clawrl train` uses `combine` when unset.",
    )
    adapters: AdaptersMode = Field(
        "shared",
        description="Whose turns train which adapter: `shared` (one lineage trained on everyone's turns, served to "
        "everyone) or `per-user` (each user's judged turns train their own LoRA lineage from the base, and each "
        "user's requests are answered by their own current version; `clawrl users`). Give `clawrl serve` and "
        "`clawrl train` the same value. LoRA only.",
    )
    batch_size: int = Field(16, ge=1, description="Samples per optimizer step; a step fires when this many are ready.")
    ppo_epochs: int = Field(
        1,
        ge=1,
        description="Passes over each batch, one optimizer step per mini-batch in each. 1 (one step per batch) takes "
        "pi_old from the step's own forward pass, so the PPO ratio is 1 and --eps-low/--eps-high never act; above 1 "
        "(or with --mini-batches above 1), pi_old is computed in one extra no-grad pass before the first step and the "
        "clip bounds how far the later steps move each token. Each pass costs about a whole step more.",
    )
    mini_batches: int = Field(
        1,
        ge=1,
        description="Parts each batch is cut into, in its order, for one optimizer step each per pass (--ppo-epochs); "
        "each part's loss is normalised as a batch of its own (--loss-agg over its tokens). 1: the whole batch; more "
        "than the batch's samples: one sample each.",
    )
    micro_batch_size: int = Field(
        4,
        ge=1,
        description="Samples per forward/backward pass (gradients are accumulated over the batch): bounds the memory.",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="When set, a micro-batch also ends before its packed size (rows x (longest prompt + longest "
        "response), padding included) would pass this many tokens: bounds activations for long agent prompts, "
        "which a sample count does not. A single longer sample still trains, alone.",
    )
    share_prefix: bool = Field(
        True,
        description="Examples of a micro-batch whose prompts share a prefix (a session's turns, a group's rollouts, "
        "one system prompt) compute it once and attend to its keys and values (a prefix tree: a session's turns "
        "share the system prompt, consecutive turns share more): exact up to rounding, and each shared prefix costs "
        "once instead of once per example.",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Keep only each decoder layer's input in the forward pass and recompute the layer in the backward "
        "pass: activations of one layer at a time instead of all of them, for a third more compute. For a single "
        "prompt longer than memory allows; it turns prefix sharing off (transformers drops the cache that carries "
        "a prefix into a checkpointed layer).",
    )
    logit_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="Response positions whose vocabulary-sized logits exist at once in an update, forward and backward "
        "(recomputed per chunk in the backward pass): bounds the output layer's memory to chunk x vocabulary floats.",
    )
    train_workers: int = Field(
        1,
        ge=1,
        description="Data-parallel training processes: the trainer and M-1 workers it starts beside it (gloo on a "
        "CPU, NCCL with one GPU each), joined by torch.distributed. Each step's micro-batches are shared out among "
        "them by packed tokens and their gradients summed, so a step is the one a single process takes (up to "
        "rounding), in about 1/M of the time where there are cores or GPUs for all of them. Each worker holds a copy "
        "of the trained weights and optimizer state. 1: the trainer alone.",
    )
    trainer_cpus: float = Field(
        1.0,
        ge=0,
        description="With --placement ray: CPUs Ray reserves for the trainer's actor and for each data-parallel "
        "worker's actor (every rank the same).",
    )
    trainer_gpus: float = Field(
        0.0,
        ge=0,
        description="With --placement ray: GPUs for the trainer's actor and for each data-parallel worker's actor "
        "(1 on a GPU cluster: each rank then sees its own GPU alone).",
    )
    lr: float | None = Field(None, gt=0, description="AdamW learning rate; unset: 1e-4 with LoRA, 1e-5 with --full.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clip per step.")
    full: bool = Field(
        False,
        description="Fine-tune every weight instead of a LoRA adapter (publishes full weights; needs a second copy "
        "of the model in memory for the frozen teacher/reference).",
    )
    lora_rank: int = Field(16, ge=1, description="LoRA rank r.")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha (scale alpha / r).")
    lora_target_modules: Names = Field(
        ["all-linear"],
        description="Modules that get LoRA adapters: `all-linear` (every linear projection except the output head) "
        "or a comma-separated list of module names such as `q_proj,v_proj`.",
    )
    teacher: Literal["base", "policy"] = Field(
        "base",
        description="OPD teacher: `base` (the frozen starting weights) or `policy` (the trainer's current weights), "
        "each given the hint; its log-probs of the recorded response are computed when the sample is built.",
    )
    max_staleness: int = Field(
        8,
        ge=0,
        description="Drop a sample when more than this many versions were published since the version that produced it.",
    )
    reward_baseline_samples: int = Field(
        0,
        ge=0,
        description="Centre each judged turn's reward on the mean of the judge's last N scores of earlier chat turns "
        "(a REINFORCE baseline): r - mean(last N), 0 if none yet. With raw +1/-1 rewards every token of an answer, "
        "the question's numbers included, is pushed the same way, so a run of mostly complaints (or mostly praise) "
        "moves what all answers share, not only what the judge liked; centring cancels that common part. 0 is off "
        "(the raw score, as upstream). Episode samples are group-normalised already and never centred.",
    )
    memory_train: Literal["without-notes", "as-served"] = Field(
        "without-notes",
        description="How a turn served with memory notes (`clawrl serve --memory on`) trains: `without-notes` (the "
        "student is the request as the client sent it, the OPD teacher the request with its notes, so the weights "
        "learn to do unprompted what the notes ask, and the importance weight corrects for the notes the answer was "
        "sampled under) or `as-served` (the turn trains on the prompt it was fed, notes in, like any other turn).",
    )
    train_seed: int = Field(0, description="Seed of the trainer (LoRA initialisation, any sampling).")
    report_to: Trackers = Field(
        default_factory=list,
        description="Experiment trackers for the step metrics and the judge's live score per version, any of "
        "tensorboard (RUN_DIR/tensorboard/), trackio, wandb (online with a W&B key, else offline in RUN_DIR/wandb/) "
        "and mlflow (MLFLOW_TRACKING_URI, else RUN_DIR/mlflow.db); each but tensorboard is an optional extra "
        "(pip install 'clawrl[trackio]'). None by default.",
    )
    report_project: str = Field("clawrl", min_length=1, description="The trackers' project (MLflow: experiment) name.")
    train_poll_s: float = Field(1.0, gt=0, description="Pause between looks for new judged turns when idle.")
    keep_versions: int | None = Field(
        None,
        ge=1,
        description="Bound the disk that policy versions take: after each publish the trainer removes the weights of "
        "every version of the lineage except the serving one, the pinned ones (`clawrl versions pin`), the parents of "
        "each of those back K steps, and the newest; their rows stay, marked pruned (a rollback to one is refused). "
        "Unset: every version is kept (each is a directory of weights and optimizer state).",
    )
    keep_versions_grace_s: float = Field(
        60.0,
        ge=0,
        description="With --keep-versions, how long a version stays on disk after it stopped being kept: serving may "
        "still be loading it, or (vLLM) read an adapter it evicted again while requests on it finish.",
    )
    episode_gamma: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Discount of an episode's outcome by distance from its end: step t of T gets outcome * gamma^(T-1-t) "
        "(plus the judge term) before group normalisation.",
    )
    step_judge_coef: float = Field(
        0.3,
        ge=0,
        description="Weight of the judge's score (+1, -1, 0) of each episode step in its step reward. Above 0, an "
        "episode group's samples wait until its steps are judged; 0 trains on the outcome alone and waits for no "
        "judge (use it with --judge off). The rule judge pays any step whose tool worked, so on terminal-like tasks it "
        "pays exploration as much as progress (an `ls`, a key press on a page): use 0 there (docs/environments.md, "
        "'Which step reward to use').",
    )

    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (1e-5 if self.full else 1e-4)
