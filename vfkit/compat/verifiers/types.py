"""`verifiers.types` of 0.1.x: the type names classic environments annotate with."""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletionMessageToolCall

from vfkit.compat.outputs import ClassicOutputs as GenerateOutputs
from vfkit.rubrics.rubric import RewardFunc
from vfkit.types import Message, Messages, SamplingArgs, State, TrajectoryStep

ChatMessage = Message
ChatMessages = list[Message]
ModelResponse = dict[str, Any]  # vfkit keeps a response as its JSON dict (`model_dump()`)
Info = dict[str, Any]
RolloutInput = dict[str, Any]
GenerateMetadata = dict[str, Any]
MessageType = str
IndividualRewardFunc = RewardFunc
GroupRewardFunc = RewardFunc

__all__ = [
    "ChatCompletionMessageToolCall", "ChatMessage", "ChatMessages", "GenerateMetadata",
    "GenerateOutputs", "GroupRewardFunc", "IndividualRewardFunc", "Info", "Message",
    "MessageType", "Messages", "ModelResponse", "RewardFunc", "RolloutInput", "SamplingArgs",
    "State", "TrajectoryStep",
]
