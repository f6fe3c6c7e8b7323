"""The data plane: tensors stay in their producer's memory, TensorRefs travel in gRPC."""
