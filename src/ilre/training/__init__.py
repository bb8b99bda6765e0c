"""What fits the data the package ships: `ilre calibrate` (the model profile, evaluation's passkeys over every
layer) and `ilre train-locret` (Locret's retaining-head weights)."""
