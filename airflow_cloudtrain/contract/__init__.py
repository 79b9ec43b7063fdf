"""The contract between the operator side and the agent on the instance: stdlib only, shipped whole in the agent zip."""
