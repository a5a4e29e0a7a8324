"""Message-queue providers of the common-messaging provider (``MessageQueueTrigger``)."""
