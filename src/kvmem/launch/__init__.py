"""`kvmem-launch`: start kvmem-server from a recipe (data files in kvmem/launch/recipes)."""
