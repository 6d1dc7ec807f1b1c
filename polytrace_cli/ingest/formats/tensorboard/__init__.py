"""TensorBoard event files."""
