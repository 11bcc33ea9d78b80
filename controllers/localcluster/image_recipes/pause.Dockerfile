# The pod sandbox's image: Kubernetes' own pause program (build/pause/linux/pause.c, compiled
# static by images.py), alone, as the same unprivileged user Kubernetes' image runs it as.
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
