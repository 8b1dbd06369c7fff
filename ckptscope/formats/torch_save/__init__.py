"""``torch.save`` files: zip and legacy readers, and the writers that rebuild them without torch."""
