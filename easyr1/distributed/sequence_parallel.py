"""Ulysses sequence parallelism: one packed micro-batch's sequence split across the ranks of a group.

With ``worker.actor.ulysses_size=N`` the world is cut into groups of N consecutive ranks. The members of a group pool
their shares of the batch (:meth:`SequenceParallelGroup.gather_rows`), so that they run the same micro-batches; each
micro-batch is packed into one row of T tokens (padded to a multiple of N) and every member runs T / N of them
through the decoder:

- the vision tower runs on a share of the micro-batch's images on each member (contiguous, balanced by patches;
  the videos shared the same way, separately), and every image's output is assembled on every member by a sum over
  the group (:func:`install_vision_split`): each member holds 1/N of the tower's activations instead of all of them.
  With fewer images than members each encodes all of them;
- the embeddings (with the images' outputs placed at the image tokens) are computed for the whole row, then the
  decoder's input, its position ids (the m-rope rows too) and Qwen3-VL's deepstack features are cut to the member's
  slice by a pre-hook on the text decoder (:func:`install`);
- in every decoder attention, queries, keys and values go from ``(B, H, T/N, d)`` to ``(B, H/N, T, d)`` by one
  all-to-all, the attention (SDPA over the packed row's block mask, or flash attention) runs on the whole sequence
  for H/N heads, and a second all-to-all brings the output back to the member's slice with every head. Key-value
  heads that N does not divide are repeated to the query heads first;
- the LM head (or the value head) runs on the member's slice only, for the response positions that fall in it; the
  log-probs, entropies (or values) of every position are then summed across the group, each member contributing its
  own (:func:`combine_owned`).

Gradients: every member computes the same loss from the combined values, so the combination passes the gradient
back unchanged (a reduction would count it N times); each member's parameter gradients then hold its slice's part,
and their sum is the whole. The images' assembled outputs are the opposite case: an image one member encoded feeds
every member's slice, so the sum that assembles them sums the gradients in the backward too (:class:`_AllReduceSum`),
and each member's tower gets the whole gradient of its own images. A forward with images has every member encode
one at least (all of them when there are fewer than N), so every vision weight gets a gradient on every rank (FSDP's
reduce-scatter needs the same set; ``models/vision_tower.py`` covers forwards without images). FSDP averages
gradients over the world; the update multiplies the loss by N so that the average over data-parallel groups comes
out (``workers/ppo_update.py``). Parameters are sharded over the whole world, as without sequence parallelism:
checkpoints do not depend on N.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from easyr1.distributed.tensor_parallel import pool_rows
from easyr1.errors import ConfigError
from easyr1.protocol import Batch


SEQUENCE_PARALLEL_ATTRIBUTE = "_easyr1_sequence_parallel"
# the attention implementations whose decoder attention the all-to-all wraps (eager attention is not dispatched through
# transformers' registry, so nothing could wrap it)
SUPPORTED_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4")


def sequence_parallel_groups(world_size: int, size: int) -> list[list[int]]:
    """The ranks of every sequence-parallel group: consecutive blocks of ``size`` ranks."""
    if size < 1 or world_size % size:
        raise ValueError(f"ulysses_size={size} must be at least 1 and divide the world size {world_size}")
    return [list(range(start, start + size)) for start in range(0, world_size, size)]


class SequenceParallelGroup:
    """This rank's sequence-parallel group. Constructing it is collective (``dist.new_group`` is): every rank builds
    its group in the same order relative to other group creations."""

    def __init__(self, size: int) -> None:
        world_size, rank = dist.get_world_size(), dist.get_rank()
        groups = sequence_parallel_groups(world_size, size)
        self.ranks = groups[rank // size]
        self.index = self.ranks.index(rank)
        self.process_group: Any = None  # the tensors' collectives (all-to-all, all-reduce): the default backend
        self.rows_group: Any = None  # the pooled rows, pickled Python objects on the host: gloo
        if size > 1:
            self.process_group, _ = dist.new_subgroups_by_enumeration(groups)
            self.rows_group, _ = dist.new_subgroups_by_enumeration(groups, backend="gloo")
        # the whole row's text positions of the forward in flight (flash attention finds its sequences in them)
        self.full_positions: torch.Tensor | None = None
        # each member encodes a share of a forward's images (and of its videos), see install_vision_split; False:
        # every member encodes all of them (the bench's comparison)
        self.split_vision = True
        self._encoding = False  # inside a split encoder call (Qwen3-VL's video features call its image features)

    @property
    def size(self) -> int:
        """How many ranks split one sequence."""
        return len(self.ranks)

    @property
    def data_parallel_size(self) -> int:
        """How many groups take different data: the world size over the group size."""
        return dist.get_world_size() // self.size

    def gather_rows(self, rows: Batch) -> tuple[Batch, list[int]]:
        """All members' rows in rank order, and the positions of this rank's own rows among them (collective)."""
        return pool_rows(rows, self.rows_group, self.index, self.size)

    def bounds(self, length: int) -> tuple[int, int]:
        """This member's slice ``[start, end)`` of a row of ``length`` tokens (a multiple of the group size)."""
        if length % self.size:
            raise ValueError(f"a row of {length} tokens cannot be split across {self.size} ranks")
        share = length // self.size
        return self.index * share, (self.index + 1) * share


def of(model: nn.Module) -> SequenceParallelGroup | None:
    """The group ``model`` runs its sequences across (:func:`install`), or ``None``."""
    return getattr(model, SEQUENCE_PARALLEL_ATTRIBUTE, None)


def padding_for(length: int, group: SequenceParallelGroup | None) -> int:
    """Tokens to append to a packed row of ``length`` tokens so that the group splits it evenly."""
    if group is None or group.size == 1:
        return 0
    return -length % group.size


# ----------------------------------------------------------------------------------------------- the collectives
class _AllToAll(torch.autograd.Function):
    """Split ``x`` along ``scatter_dim`` into one chunk per member, send chunk j to member j, concatenate what arrives
    along ``gather_dim``; the backward is the opposite exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        size = dist.get_world_size(group)
        inputs = [chunk.contiguous() for chunk in x.chunk(size, dim=scatter_dim)]
        outputs = [torch.empty_like(inputs[0]) for _ in range(size)]
        dist.all_to_all(outputs, inputs, group=group)
        return torch.cat(outputs, dim=gather_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _AllToAll.apply(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, group: SequenceParallelGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """:class:`_AllToAll` over the group (differentiable)."""
    return _AllToAll.apply(x, group.process_group, scatter_dim, gather_dim)


class _SumOfOwnedParts(torch.autograd.Function):
    """The group's sum of tensors that are zero outside each member's own entries; the gradient passes unchanged,
    since every member computes the same loss from the sum."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        total = x.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def group_sum(values: torch.Tensor, group: SequenceParallelGroup) -> torch.Tensor:
    """The sum of ``values`` over the group's members, for a loss every member computes the same way from it: the
    gradient passes back unchanged (:class:`_SumOfOwnedParts`)."""
    return _SumOfOwnedParts.apply(values, group.process_group)


def local_token_mask(group: SequenceParallelGroup, tokens: int, device: torch.device | str) -> torch.Tensor:
    """(T / N,) mask of this member's slice of a packed row of ``tokens`` tokens padded for the group
    (:func:`padding_for`): 1 for the row's tokens, 0 for the padding."""
    start, end = group.bounds(tokens + padding_for(tokens, group))
    return (torch.arange(start, end, device=device) < tokens).float()


def combine_owned(
    values: torch.Tensor, owned: torch.Tensor, shape: tuple[int, ...], group: SequenceParallelGroup
) -> torch.Tensor:
    """The group's whole ``shape`` tensor from each member's ``values`` at the flat positions ``owned`` (a boolean
    mask over ``shape``'s elements; every element owned by exactly one member). Differentiable, see
    :class:`_SumOfOwnedParts`."""
    flat = values.new_zeros(owned.numel()).masked_scatter(owned, values)
    return group_sum(flat, group).view(shape)


class _AllReduceSum(torch.autograd.Function):
    """The group's sum of ``x``, whose backward sums the gradients across the group as well: a member's vision
    embeddings feed every member's slice, so their gradient is the sum of what every member sends back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        total = x.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        total = grad.clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


# --------------------------------------------------------------------------------------------- the vision tower
def balanced_shares(costs: list[int], size: int) -> list[tuple[int, int]]:
    """``size`` contiguous, non-empty ranges ``[start, end)`` of the units whose ``costs`` are given (at least
    ``size`` of them), the largest range's total cost as small as it can be."""
    if len(costs) < size:
        raise ValueError(f"{len(costs)} units cannot be shared by {size} members, each with one at least")

    def cut(limit: int) -> list[tuple[int, int]] | None:
        shares, start = [], 0
        for member in range(size):
            later = size - 1 - member  # members after this one, each needing a unit
            end, load = start + 1, costs[start]
            while end < len(costs) - later and load + costs[end] <= limit:
                load, end = load + costs[end], end + 1
            if load > limit:
                return None
            shares.append((start, end))
            start = end
        return shares if start == len(costs) else None

    low, high = max(costs), sum(costs)
    while low < high:
        middle = (low + high) // 2
        if cut(middle) is None:
            low = middle + 1
        else:
            high = middle
    shares = cut(low)
    assert shares is not None
    return shares


def _unit_rows(pixels: torch.Tensor, grid: torch.Tensor | None) -> list[int]:
    """Rows of ``pixels`` per image (or video): the patches of its ``(t, h, w)`` grid row (the Qwen-VL and GLM
    layout), or one row per tile when there is no grid (InternVL: every tile its own picture)."""
    if grid is None:
        return [1] * pixels.shape[0]
    return [int(rows) for rows in grid.prod(dim=-1).tolist()]


def _encoder_outputs_parts(output: Any) -> tuple[list[list[torch.Tensor]], bool]:
    """The per-unit tensors an encoder output carries for the forward: ``pooler_output`` (a tuple per image, or a
    ``(tiles, tokens, width)`` tensor) and, for Qwen3-VL, each deepstack layer's features; whether the pooler
    output is one tensor."""
    pooled = output.pooler_output
    stacked = isinstance(pooled, torch.Tensor)
    fields = [list(pooled.unbind(0)) if stacked else list(pooled)]
    for layer in getattr(output, "deepstack_features", None) or []:
        fields.append(list(layer))
    return fields, stacked


def _split_encoder(group: SequenceParallelGroup, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a model's ``get_image_features`` or ``get_video_features``) run by each member on a contiguous
    share of the images, balanced by patches, and the output of every image assembled on every member by a sum over
    the group whose backward sums the gradients (:class:`_AllReduceSum`). Fewer images than members, a nested call,
    a call that asks for no output object (``return_dict``) or ``group.split_vision`` off: ``original`` as it is."""
    import inspect

    names = list(inspect.signature(original).parameters)

    def encode(*args: Any, **kwargs: Any) -> Any:
        call = dict(zip(names, args))
        call.update(kwargs)
        pixel_key = names[0]
        grid_key = names[1] if len(names) > 1 and names[1].endswith("grid_thw") else None
        pixels, grid = call.get(pixel_key), call.get(grid_key) if grid_key else None
        if group._encoding or not group.split_vision or not call.get("return_dict") or pixels is None:
            return original(*args, **kwargs)
        rows = _unit_rows(pixels, grid)
        if len(rows) < group.size:
            return original(*args, **kwargs)
        first, last = balanced_shares(rows, group.size)[group.index]
        offsets = [0, *torch.tensor(rows).cumsum(0).tolist()]
        # a copy: the patch embedding keeps its input for the backward, and a view would keep every image's pixels
        call[pixel_key] = pixels[offsets[first] : offsets[last]].clone()
        if grid_key:
            call[grid_key] = grid[first:last]
        group._encoding = True
        try:
            output = original(**call)
        finally:
            group._encoding = False
        fields, stacked = _encoder_outputs_parts(output)
        widths = [field[0].shape[-1] for field in fields]
        local = torch.cat([torch.cat([unit.reshape(-1, unit.shape[-1]) for unit in field]) for field in fields], -1)
        # every unit's number of output rows, for the members that did not encode it
        counts = torch.zeros(len(rows), dtype=torch.long, device=local.device)
        counts[first:last] = torch.tensor([unit.numel() // widths[0] for unit in fields[0]], device=local.device)
        dist.all_reduce(counts, group=group.process_group)
        counts = counts.tolist()
        before, after = sum(counts[:first]), sum(counts[last:])
        whole = torch.cat([local.new_zeros(before, local.shape[1]), local, local.new_zeros(after, local.shape[1])])
        whole = _AllReduceSum.apply(whole, group.process_group)
        assembled = [part.split(counts) for part in whole.split(widths, dim=-1)]
        pooled = assembled[0]
        if stacked:  # (tiles, tokens, width) as the encoder gives it
            pooled = torch.stack(pooled)
        result = {"pooler_output": pooled}
        if len(assembled) > 1:
            result["deepstack_features"] = assembled[1:]
        return type(output)(**result)

    encode.easyr1_split_encoder = True
    return encode


def install_vision_split(model: nn.Module, group: SequenceParallelGroup) -> None:
    """Wrap the image and video encoders of ``model``'s innermost module that has them (the one whose forward calls
    them: ``Qwen2_5_VLModel`` inside ``Qwen2_5_VLForConditionalGeneration``) with :func:`_split_encoder`; text-only
    models have none."""
    holders = [module for module in model.modules() if hasattr(module, "get_image_features")]
    inner = [
        module
        for module in holders
        if not any(other is not module and hasattr(other, "get_image_features") for other in module.modules())
    ]
    for module in inner:
        for name in ("get_image_features", "get_video_features"):
            method = getattr(module, name, None)
            if method is not None and not getattr(method, "easyr1_split_encoder", False):
                setattr(module, name, _split_encoder(group, method))


# ------------------------------------------------------------------------------------------------ the attention
class _SharedKeyValueHeads:
    """``module`` as the attention function sees it after the key-value heads were repeated to the query heads."""

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self.num_key_value_groups = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _repeat_heads(states: torch.Tensor, times: int) -> torch.Tensor:
    """(B, kv_heads, T, d) -> (B, kv_heads * times, T, d), each head repeated in place (query heads' grouping)."""
    return states.repeat_interleave(times, dim=1) if times > 1 else states


def sequence_parallel_attention(inner: Callable[..., Any]) -> Callable[..., Any]:
    """An attention function that runs ``inner`` over the whole sequence for a share of the heads, for modules
    :func:`install` marked; other calls (the vision tower, an unmarked model) go to ``inner`` unchanged."""

    def attention(
        module: nn.Module,
        query: torch.Tensor,  # (B, H, T/N, d)
        key: torch.Tensor,  # (B, H_kv, T/N, d)
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        group: SequenceParallelGroup | None = getattr(module, SEQUENCE_PARALLEL_ATTRIBUTE, None)
        if group is None or group.size == 1:
            return inner(module, query, key, value, attention_mask, **kwargs)
        size = group.size
        if key.shape[1] % size:  # fewer key-value heads than ranks (or not a multiple): each rank gets its queries'
            groups = query.shape[1] // key.shape[1]
            key, value = _repeat_heads(key, groups), _repeat_heads(value, groups)
            module = _SharedKeyValueHeads(module)
        query, key, value = (all_to_all(states, group, scatter_dim=1, gather_dim=2) for states in (query, key, value))
        if "position_ids" in kwargs and group.full_positions is not None:
            kwargs["position_ids"] = group.full_positions  # flash attention: the whole row's sequence starts
        output, weights = inner(module, query, key, value, attention_mask, **kwargs)  # (B, T, H/N, d)
        return all_to_all(output, group, scatter_dim=1, gather_dim=2), weights  # (B, T/N, H, d)

    attention.easyr1_sequence_parallel = True
    return attention


_wrapped: set[str] = set()


def _wrap_attention(implementation: str) -> None:
    """Register :func:`sequence_parallel_attention` around transformers' function for ``implementation``, once."""
    if implementation in _wrapped:
        return
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation == "sdpa":
        from easyr1.workers import block_attention

        block_attention.install()  # first, so that its registration cannot replace this one later
    inner = ALL_ATTENTION_FUNCTIONS[implementation]
    if not getattr(inner, "easyr1_sequence_parallel", False):
        AttentionInterface.register(implementation, sequence_parallel_attention(inner))
    _wrapped.add(implementation)


# ------------------------------------------------------------------------------------------------- the decoder
def text_decoder(model: nn.Module) -> nn.Module:
    """The text decoder inside ``model`` (the module holding ``embed_tokens`` and the decoder ``layers``), found by
    structure so that wrappers (LoRA, the value model) and every family's nesting are covered."""
    for _, module in model.named_modules():
        if hasattr(module, "embed_tokens") and isinstance(getattr(module, "layers", None), nn.ModuleList):
            return module
    raise ValueError(f"{type(model).__name__}: no text decoder (a module with embed_tokens and layers) found")


def _slice_tokens(value: torch.Tensor, start: int, end: int, dim: int) -> torch.Tensor:
    return value.narrow(dim, start, end - start)


def _decoder_pre_hook(group: SequenceParallelGroup) -> Callable[..., Any]:
    def cut(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        if args:
            raise TypeError("the text decoder is called with keyword arguments only under sequence parallelism")
        embeds = kwargs.get("inputs_embeds")
        tokens = embeds if embeds is not None else kwargs["input_ids"]
        start, end = group.bounds(tokens.shape[1])
        if embeds is not None:
            kwargs["inputs_embeds"] = _slice_tokens(embeds, start, end, 1)
        else:
            kwargs["input_ids"] = _slice_tokens(kwargs["input_ids"], start, end, 1)
        positions = kwargs.get("position_ids")
        if positions is None:
            raise ValueError("sequence parallelism needs explicit position ids (the packed row's restarts)")
        group.full_positions = positions[0] if positions.dim() == 3 else positions
        kwargs["position_ids"] = _slice_tokens(positions, start, end, positions.dim() - 1)
        visual = kwargs.get("visual_pos_masks")
        if visual is not None:  # Qwen3-VL's deepstack: features added to the vision tokens of early layers
            before, inside = int(visual[:, :start].sum()), int(visual[:, start:end].sum())
            kwargs["visual_pos_masks"] = _slice_tokens(visual, start, end, 1)
            deepstack = kwargs.get("deepstack_visual_embeds")
            if deepstack is not None:
                kwargs["deepstack_visual_embeds"] = [features[before : before + inside] for features in deepstack]
        return args, kwargs

    return cut


def check_model(model: nn.Module, size: int, key: str) -> None:
    """Refuse, before any forward, what the split cannot run: heads N does not divide, linear attention (a state
    along the sequence), families that build their own masks from token types, eager attention."""
    from easyr1.models.families import family_of
    from easyr1.models.linear_attention import has_linear_attention

    config = model.config
    text = getattr(config, "text_config", None) or config
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    name = getattr(config, "model_type", type(model).__name__)
    if heads is None or heads % size:
        raise ConfigError(
            f"{key}={size}: the model ({name}) has {heads} attention heads ({kv_heads} key-value heads), which "
            f"{size} ranks cannot share evenly; use a ulysses_size that divides {heads}"
        )
    if has_linear_attention(config):
        raise ConfigError(
            f"{key}={size}: {name} has linear-attention layers, whose state runs along the whole sequence and cannot "
            "be split across ranks; set ulysses_size=1"
        )
    if family_of(config).token_types is not None:
        raise ConfigError(
            f"{key}={size}: {name} builds its attention masks from token types (bidirectional image blocks, sliding "
            "windows), which the split does not carry; set ulysses_size=1"
        )
    implementation = str(getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", ""))
    if implementation not in SUPPORTED_ATTENTION:
        raise ConfigError(
            f"{key}={size}: the model runs {implementation!r} attention; sequence parallelism needs one of "
            f"{', '.join(SUPPORTED_ATTENTION)}"
        )


def install(model: nn.Module, group: SequenceParallelGroup, key: str = "worker.actor.ulysses_size") -> None:
    """Run ``model``'s forwards across ``group``: mark it and its decoder attentions, cut the decoder's input to this
    rank's slice, wrap the attention implementation. A group of one leaves the model as it is; a model installed
    already is refused (a second pre-hook would cut the slice again)."""
    if group.size == 1:
        return
    if of(model) is not None:
        raise ValueError(f"{type(model).__name__} already runs its sequences across a group")
    check_model(model, group.size, key)
    decoder = text_decoder(model)
    for layer in decoder.layers:
        attention = getattr(layer, "self_attn", None)
        if attention is None:
            raise ValueError(f"{type(layer).__name__} has no self_attn to split across ranks")
        setattr(attention, SEQUENCE_PARALLEL_ATTRIBUTE, group)
    decoder.register_forward_pre_hook(_decoder_pre_hook(group), with_kwargs=True)
    install_vision_split(model, group)
    text = getattr(model.config, "text_config", None) or model.config
    _wrap_attention(str(getattr(text, "_attn_implementation", None) or model.config._attn_implementation))
    setattr(model, SEQUENCE_PARALLEL_ATTRIBUTE, group)
    if dist.get_rank() == 0:  # one line per model in the run's output (make check-ulysses looks for it)
        print(
            f"easyr1: {key}={group.size}: {type(model).__name__}'s {len(decoder.layers)} decoder layers split "
            f"across each group of {group.size} ranks",
            flush=True,
        )
