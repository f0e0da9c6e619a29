"""The ways to run a step's model, one file each. ModelRunner asks them in order
(fused_stack, cuda_graph, compiled, eager) and runs the first whose `accepts` says yes; eager
takes every step. A new way to run a step is a new file here and a place in that order."""

from surge.engine.runner.step_paths.base import StepBatch, StepPath
from surge.engine.runner.step_paths.compiled import CompiledPath
from surge.engine.runner.step_paths.cuda_graph import CudaGraphPath
from surge.engine.runner.step_paths.eager import EagerPath
from surge.engine.runner.step_paths.fused_stack import FusedStackPath

__all__ = ["CompiledPath", "CudaGraphPath", "EagerPath", "FusedStackPath", "StepBatch", "StepPath"]
