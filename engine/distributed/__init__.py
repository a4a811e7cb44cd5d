"""Scale-out on Ray (optional extra): a job queue whose workers are Ray actors.

``router`` (pure routing logic) and ``worker`` (the actor's class) import no Ray; ``pool``,
``ray_queue`` users and ``cli`` need ``pip install ray``. See README.md in this folder.
"""
