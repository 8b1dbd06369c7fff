"""Operations on checkpoints (inspect, ...): pure functions and dataclasses, no UI imports."""
